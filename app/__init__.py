"""The Medusa Playground web app: Gradio views over the traces the `decoding` engine records.

The boundary with the engine: every figure and number about a run is read from its `RunTrace`.
Of a loaded model the app reads only what describes it (name, trees and default tree, number of
heads, context length, device and dtype, for its controls and its card) and asks the engine which
drafters it offers; it never calls the model, its heads or its cache itself. The one exception is
`app/models.py` asking torch whether a GPU is present, to size its cache of loaded models.
"""

# The environment variable that names the model the page starts on and lists first. It lives
# here, where importing it costs nothing: app/models.py reads it, and scripts/deploy.py (on a
# Space) and scripts/screenshots.py (for the app it starts) set it without importing torch or gradio.
MODEL_ENV = "MEDUSA_PLAYGROUND_MODEL"
