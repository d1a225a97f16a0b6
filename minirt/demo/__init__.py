"""The data of ``minirt demo``: the digits CNN (``digits_cnn.onnx``), its held-out images
(``heldout.npz``) and calibration inputs (``calibration.npz``), shipped inside the package so that the
demo also runs after ``pip install``.  ``examples/digits/`` links to these files (its ``train.py``
makes them).  The device wheel (``MINIRT_WHEEL=runtime``, setup.py) leaves them out."""
