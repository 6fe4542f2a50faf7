"""``python -m objreg``: the same CLI as the ``objreg`` console script."""

from objreg.cli import main

if __name__ == "__main__":
    main()
