"""Training: everything that makes weights. The decoding engine never imports this package."""
