"""Computing what many grafted rows share once: prefix sharing (positions before a row's
first difference) and depth sharing (also the layers below it)."""
