"""The request classifier's model, offline: its data (``data/``), training (``train.py``, in the
train environment: scikit-learn), the shipped weights (``weights/``) and their evaluation
(``evaluate.py``, pure Python: the gateway environment). The gateway reads only the weights
file, through gateway/request/classify/prompt_model.py."""
