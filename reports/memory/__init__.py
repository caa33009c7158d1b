"""Memory: live bytes by category, storage lifetimes and in-place resizes, views against copies."""
