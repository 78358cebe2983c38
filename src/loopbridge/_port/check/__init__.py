"""Drafting's last stage: build the drafted port, fill it with the Linen variables, compare it
with Linen on every call and configuration, and report the verdict."""
