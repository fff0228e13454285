"""The operator surface on the command line: `sessionctl` and the demo (top layer)."""
