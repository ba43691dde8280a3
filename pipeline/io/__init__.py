"""Files on disk, written safely: ``files`` (reading inputs with one-line errors), ``atomic`` (writes
and replacements that never leave half an output) and ``hashing`` (fingerprints of inputs).
"""
