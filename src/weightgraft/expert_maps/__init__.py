"""Expert maps of a mixture of experts: which experts, at which positions, carry a finetune's
effect, each cell an exact graft, overlaid with the experts the serving router picked."""
