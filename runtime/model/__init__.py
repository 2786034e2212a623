"""The model side: find model folders, load weights into our Llama-family model, and run one forward."""
