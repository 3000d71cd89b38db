"""What the plot scripts of scripts/bench-apps share: matplotlib, headless, or None (saying
why) when this python3 has none (Debian's python3-matplotlib, installed by scripts/setup)."""
import sys


def pyplot(who):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print(f"{who}: no matplotlib (python3-matplotlib): no plot", file=sys.stderr)
        return None
