"""The notebook face: the `%%neuraldbg` magic, the live panel and the inspector.

Views read runs; they never compute detection or write engine state.
"""
