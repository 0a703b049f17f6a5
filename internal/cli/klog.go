package cli

import (
	"github.com/go-logr/zerologr"
	"github.com/rs/zerolog"
	"k8s.io/klog/v2"
)

// RouteKlog sends client-go's klog output (reflector warnings, leader
// election) through log, so a collector reads one format: without it klog
// writes its own "W1125 ... reflector.go:561]" text to stderr. klog keeps
// its logger in package state (its choice, not ours): the last call wins.
// zerologr maps logr verbosity 0 to info, 1 to debug; klog's errors stay
// errors.
func RouteKlog(log *zerolog.Logger) {
	l := log.With().Str("logger", "klog").Logger()
	klog.SetLogger(zerologr.New(&l))
}
