import sys

from attn.cli import main

if __name__ == "__main__":
    sys.exit(main())
