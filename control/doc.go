// Package control is turnout's control loop: it owns everything that starts,
// changes and retires while turnout serves. Its one job: take configs from
// their sources (the file on SIGHUP or when it changes, Kubernetes
// EndpointSlices through control/discovery), validate them, open and close
// the listeners they name (the HTTP API, the SPOE agent, the feedback
// socket), apply them to the decision core, bring the proxies along (HAProxy
// runtime sync, nginx render and reload, each reload logged with its reason
// by haproxy/ and nginx/), and retire what a change made obsolete. The
// decision core itself (route/) never sees a source, a socket or a proxy.
//
// # Goroutines
//
// Three goroutines change state, each with one role; everything else only
// signals them:
//
//   - The loop: Run's own goroutine. It takes SIGHUP and file changes (the
//     file poller only sends it a wake-up) one at a time, so reloads never
//     overlap: load and validate, bind new listeners, apply through the
//     fleet, start the listeners. A rejected config changes nothing.
//   - The fleet (discovery.Fleet.Run): merges discovered endpoints into the
//     file config after each burst of changes and applies the merge through
//     the same apply as a reload. The fleet calls apply under its own lock,
//     which the loop's SetBase takes too, so applies never overlap either.
//   - The proxy worker: syncs the proxies to the newest applied config
//     (a config waiting to be synced is replaced by a newer one, never
//     queued behind it), the proxies side by side, and only then retires
//     the listeners the synced config replaced, after a grace period.
//
// Listener retirement runs on timers (time.AfterFunc) that close a socket
// after its grace; the listener set is guarded by its mutex for them.
//
// Serve also starts the decision core's own loops (decision-TTL ticks,
// health and served-model checks, engine-load scrapes, cluster sync): they
// change endpoint state inside route/, never the loop's.
package control
