"""`python -m store.cli ...` runs the `store` command."""

from store.cli import main

if __name__ == "__main__":
    main()
