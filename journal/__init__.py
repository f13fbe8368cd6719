"""Pure evidence formats: strict and canonical JSON, the cleanup journal.

Nothing here imports another casebox package, needs privileges, or touches
the network, so a reviewer can run it on any machine.
"""
