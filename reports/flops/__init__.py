"""FLOP accounting: the 2/4/6·N·T breakdown and its explanation, parameter roles, recomputation, MFU and peaks, coverage."""
