import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)                    # scenario.py
sys.path.insert(0, os.path.dirname(HERE))   # the kvmem package of this checkout
