"""Medusa Playground: `python app.py`, then open the address it prints.

Host and port come from Gradio's own GRADIO_SERVER_NAME / GRADIO_SERVER_PORT variables.
Model work waits in one queue, so concurrent visitors take turns and none is dropped.
"""

import app.gpu  # noqa: F401  (first: on a ZeroGPU Space, `spaces` must load before torch)
from app.layout import build_demo, launch_options

demo = build_demo()

if __name__ == "__main__":
    demo.launch(**launch_options())
