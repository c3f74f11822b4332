"""The Medusa Playground web app: Gradio views over the traces the `decoding` engine records.

Nothing in here touches model internals: every figure and number is read from a `RunTrace`.
"""
