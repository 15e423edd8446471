"""The receiver-side math of an exchange (docs/algorithm.md): the compatibility gate and peer
weights (Eqs. 6-8), peer advantages, the objectives and their ratios, the receiver's rows and
how they are cut into minibatches."""
