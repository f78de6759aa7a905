"""Tools around the `store` library, outside its core: `store bench` and `store demo`.

`import store` never imports this package; only the CLI's `bench` and `demo`
commands load it, inside the command functions.
"""
