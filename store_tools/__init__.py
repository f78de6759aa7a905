"""Tools around the `store` library, outside its core: `store bench` and `store demo`.

The library never imports this package; the CLI loads it only to run those
two commands.
"""
