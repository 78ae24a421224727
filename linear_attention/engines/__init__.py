"""The numerical core, one folder per recurrence.

``decay/`` (diagonal-decay linear attention), ``delta/`` (the delta rule), ``dplr/``
(diagonal plus low rank), ``scan/`` (the elementwise linear recurrence) and ``softmax/``
(exact attention): each holds ``engine.py`` (its XLA forms and public entry point),
``terms.py`` where its Pallas kernel shares the chunk algebra, and ``pallas/`` (its GPU and
TPU kernels). Beside them: ``dispatch.py`` (which implementation runs where, and the
per-backend chunk length), ``context.py`` (``SeqContext`` and the sharded call every engine
shares) and ``chunks.py`` (chunk algebra every chunk form shares). The public names are in
:mod:`linear_attention.ops`.
"""
