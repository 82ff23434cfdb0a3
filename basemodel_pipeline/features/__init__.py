"""Feature encoding: the sketch encoder, its kernels, Cleora embeddings, DLSH and the aggregate features."""
