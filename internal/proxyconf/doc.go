// Package proxyconf holds what the HAProxy and nginx renderers share: the
// checks every config value passes before it reaches a proxy's file, atomic
// file writing, and checking a render in a scratch directory with the
// proxy's own binary. haproxy/ and nginx/ keep only what differs between
// the two proxies (templates, plan, reload).
package proxyconf
