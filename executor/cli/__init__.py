"""The ``casebox`` command: the argparse tree, one module per command group, front-end conventions, configuration, reporting."""
