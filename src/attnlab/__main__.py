"""``python -m attnlab``: the ``attnlab`` command (for an environment whose scripts folder is not on the PATH)."""

from attnlab.cli.main import main

if __name__ == "__main__":
    main()
