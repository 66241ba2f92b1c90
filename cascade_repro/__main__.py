"""``python -m cascade_repro``: the same CLI as the ``cascade-repro`` console script.

Useful where the console script is not on PATH or was written for another interpreter (an install
made with ``pip --target`` on one machine and unpacked on another).
"""

from cascade_repro.cli import main

if __name__ == "__main__":
    main()
