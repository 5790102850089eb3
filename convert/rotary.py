"""The rows of q and k in barellm's RoPE layout (docs/FORMAT.md).

barellm rotates element i of a head with element i + head_dim/2 (rotate-half over the whole
head), the pairs past rotary_dim / 2 with frequency 0, which leaves them unchanged. A Hugging
Face model with a partial rotary (Phi-3's partial_rotary_factor: rotary_dim < head_dim)
rotates element i with i + rotary_dim/2 among the first rotary_dim elements and leaves the
others: reordering each head's q and k rows by partial_rotary_order makes one layout the
other. q · k is a sum over a head's elements, so the same reorder of q and k leaves every
attention score as it was."""

import numpy as np


def partial_rotary_order(head_dim, rotary_dim):
    """order[r]: the row of a Hugging Face head (partial rotary of rotary_dim) that becomes
    row r of barellm's head: barellm's pair (p, p + head_dim/2) is Hugging Face's rotated pair
    (p, p + rotary_dim/2) for p < rotary_dim/2, and after it two unrotated elements. The
    identity when rotary_dim == head_dim."""
    half, rotated_half, rest_half = head_dim // 2, rotary_dim // 2, (head_dim - rotary_dim) // 2
    order = []
    for t in (0, 1):  # barellm's first half, then its second
        for p in range(half):
            if p < rotated_half:
                order.append(t * rotated_half + p)
            else:
                order.append(rotary_dim + t * rest_half + (p - rotated_half))
    return np.array(order)


def head_rows(rows, head_dim, order):
    """Row indices of a matrix of heads of head_dim rows each, each head's rows in `order`
    (an order within one head)."""
    row = np.arange(rows)
    return row // head_dim * head_dim + np.asarray(order)[row % head_dim]
