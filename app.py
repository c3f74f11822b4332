"""Medusa Playground: `python app.py`, then open the address it prints.

Host and port come from Gradio's own GRADIO_SERVER_NAME / GRADIO_SERVER_PORT variables.
Model work waits in one queue, so concurrent visitors take turns and none is dropped.
"""

import os

# Gradio sends usage analytics to its servers unless told not to. This app runs offline, so it
# is off unless GRADIO_ANALYTICS_ENABLED (Gradio's own switch) says otherwise; set before any
# import can load gradio.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import app.gpu  # noqa: E402, F401  (first: on a ZeroGPU Space, `spaces` must load before torch)
from app.layout import build_demo, launch_options  # noqa: E402

demo = build_demo()

if __name__ == "__main__":
    demo.launch(**launch_options())
