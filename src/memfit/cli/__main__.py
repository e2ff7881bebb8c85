"""`python -m memfit.cli ...`: the same as the `memfit` console script."""

from memfit.cli.app import main

if __name__ == "__main__":
    main()
