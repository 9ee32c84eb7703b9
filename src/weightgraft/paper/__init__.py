"""The paper's own numbers, to set beside ours (issue 43).

``weightgraft.paper.numbers`` reads ``numbers.csv`` (shipped with the package): one row per
number the paper (Nief et al., ``../shared/paper/paper-full-text.txt``) states about its
experiments, and one per bar it shows without stating a value; and it lays out the side-by-side
rows (one per figure, scheme and metric: the paper's values with their models, ours with its
interval and the number of prompts, and the verdict) and their markdown. Nothing is read or imported
here: import ``weightgraft.paper.numbers``.
"""
