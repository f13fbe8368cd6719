"""The minimal root launcher, provisioned as one file: bootstrap, drop, READY, ops."""
