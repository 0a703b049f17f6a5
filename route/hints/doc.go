// Package hints watches a Decider's traffic for settings that quietly do
// nothing and says why in the log, once per pool until the traffic
// changes: a prefix policy whose prompts are shorter than one block has
// nothing to match and balances every request by load.
package hints
