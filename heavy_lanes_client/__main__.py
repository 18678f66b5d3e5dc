"""`python -m heavy_lanes_client ...`: see heavy_lanes_client.cli."""
import sys

from heavy_lanes_client.cli import main

if __name__ == '__main__':
    sys.exit(main())
