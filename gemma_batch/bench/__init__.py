"""`gemma-batch bench`: speed of the real engine on random weights of the real Gemma 3 shapes.

`shapes.py` (the shape table), `random_weights.py` (fast random tensors in any weight format),
`runner.py` (the cases through the engine, timed per step), `metrics.py` (figures and the decode
roofline), `report.py` (table and JSON).
"""
