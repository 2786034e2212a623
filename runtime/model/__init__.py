"""The model side: find model folders, load weights into our model of their family (families.py), and run one forward."""
