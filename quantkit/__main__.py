"""`python -m quantkit` and the `quantkit` console script."""

import os
import sys


def entry() -> None:
    """Run the CLI; Ctrl-C while the CLI itself is still importing is one line and exit 130 too."""
    try:
        from quantkit.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted by SIGINT while starting; nothing was written\n")
        sys.stderr.flush()
        os._exit(130)
    main()


if __name__ == "__main__":
    entry()
