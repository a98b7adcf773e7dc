"""zerompi: a readable reference implementation of ZeRO stages 0-3 over MPI (see README.md).

Two parts, as `ls zerompi/` shows them:

    the reference   the core: the modules in this folder, stages/ and memory/ (the ZeRO mainline,
                    README's reading order); the layers a first reading can skip, one folder
                    each: overlap/, hierarchy/, devices/, checkpoint/, observe/, plan/,
                    offload/, quantize/
    the program     train/: `python -m zerompi.train` and the commands beside it; the other
                    packages' __main__.py are doors into it
    util/           helpers with no ZeRO in them, for both

The reference never imports the program; the core imports no layer (tools/import_graph.py).
"""
__version__ = "0.1.0"
