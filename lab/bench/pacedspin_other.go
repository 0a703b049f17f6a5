//go:build !linux

package bench

import (
	"context"
	"errors"
	"time"
)

// spinPaced needs Linux's epoll; elsewhere the timer pacer runs.
func spinPaced(context.Context, string, [][]byte, feedbackTo, int, float64, time.Duration, int) (*LoadResult, error) {
	return nil, errors.New("spin paced: Linux only (use the timer pacer)")
}
