import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C before the entry point could take over: no traceback
    sys.stderr.write("settled: interrupted\n")
    sys.exit(130)

main()
