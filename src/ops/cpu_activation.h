// The CPU backend's activation pass for the feed-forward block's backward.
#pragma once

#include "hone/backend.h"

namespace hone {

// y = act(x) and g *= act'(x) in one pass over x, each GELU's erf or tanh computed once;
// the values equal activation_forward's and activation_backward's to the bit.
void activation_with_grad(Activation a, const Tensor& x, Tensor& y, Tensor& g);

}  // namespace hone
