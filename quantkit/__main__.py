"""`python -m quantkit`: the same as the `quantkit` command."""

from quantkit.cli import main

if __name__ == "__main__":
    main()
