// Package kube follows Kubernetes discovery.k8s.io/v1 EndpointSlices (and
// Pods, when a pool maps pods to roles by label), or an InferencePool
// (inference.networking.k8s.io/v1) and the Pods it selects, through
// client-go shared informers, and reports each discovered pool's
// endpoints: ready ones available, serving-and-terminating ones draining,
// everything else absent.
//
// It never writes to the API: get/list/watch on endpointslices (and pods
// with role_label), or on inferencepools and pods, is all it needs
// (deploy/kubernetes/rbac.yaml).
package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/cespare/xxhash/v2"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Log field names.
const (
	fieldPool      = "pool"
	fieldNamespace = "namespace"
	fieldSelector  = "selector"
	fieldSlice     = "slice"
	fieldReason    = "reason"
)

// ErrNoKubeConfig reports that neither a kubeconfig nor in-cluster credentials were found.
var ErrNoKubeConfig = errors.New("no kubernetes configuration")

// serviceNameLabel links an EndpointSlice to its Service.
const serviceNameLabel = discoveryv1.LabelServiceName

// inClusterNamespace is where a pod finds its own namespace.
const inClusterNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// RESTConfig returns the API client config: kubeconfig (the path, else
// $KUBECONFIG) when given, else the in-cluster service account.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" || os.Getenv("KUBECONFIG") != "" {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = kubeconfig
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("%w: not in a cluster (%w) and no --kubeconfig or KUBECONFIG", ErrNoKubeConfig, err)
	}
	cfg.UserAgent = "turnout"
	// Informers list once and then watch: a small budget is plenty.
	cfg.QPS, cfg.Burst = 20, 40
	return cfg, nil
}

// DefaultNamespace is turnout's own namespace in a cluster, else "default".
func DefaultNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile(inClusterNamespace); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "default"
}

// Options configure a Source.
type Options struct {
	Client *Client
	Log    *zerolog.Logger
	// Notify is called (cheaply, from informer goroutines) whenever a watched
	// object changed or a watch synced; the caller debounces and then reads
	// Endpoints.
	Notify func()
	// Namespace replaces "" namespaces (default DefaultNamespace()).
	Namespace string
}

// Source watches what the config's kubernetes pools need.
type Source struct {
	opts Options
	log  *zerolog.Logger

	mu      sync.Mutex
	pools   []poolWatch
	watches map[watchKey]*watch
	warned  map[string]bool
}

// poolWatch is one pool's view: which slices and (optionally) which pods.
type poolWatch struct {
	field  string // config path, for messages
	pool   string // route.PoolName
	k      config.KubernetesDiscovery
	ns     string
	slices *watch // nil with inference_pool
	pods   *watch // nil without role_label and model_label, or the InferencePool's selector not known yet
	// ipool watches the namespace's InferencePools (inference_pool only).
	ipool *watch
	roles map[string]bool
	// models are the deployment's model names (model_label).
	models  map[string]bool
	addrTyp discoveryv1.AddressType
}

// watchKey identifies one informer: a kind in a namespace with a label selector.
type watchKey struct {
	kind, ns, selector string
}

// watch is one running informer.
type watch struct {
	key    watchKey
	inf    cache.SharedIndexInformer
	stop   chan struct{}
	failed atomic.Bool // last list/watch failed and no event arrived since
	errLog atomic.Int64
	// missing: the last list found the resource not served (InferencePool
	// CRD not installed); polling: pollServed runs for it; reselected: a
	// pod watch replacing another after an InferencePool selector change,
	// whose first list does not hold back Synced.
	missing, polling, reselected atomic.Bool
	// restarting: Restart is replacing it (guarded by Source.mu).
	restarting bool
}

// New returns a Source; Configure starts its watches.
func New(opts Options) *Source {
	if opts.Log == nil {
		l := zerolog.Nop()
		opts.Log = &l
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace()
	}
	if opts.Notify == nil {
		opts.Notify = func() {}
	}
	return &Source{opts: opts, log: opts.Log, watches: map[watchKey]*watch{}, warned: map[string]bool{}}
}

// Check validates the kubernetes discovery settings that need the API
// machinery (label selectors), naming the field; config.Config.Validate
// checks the rest.
func Check(cfg *config.Config) error {
	var errs []error
	for i := range cfg.Deployments {
		for j := range cfg.Deployments[i].Pools {
			p := &cfg.Deployments[i].Pools[j]
			if p.Discovery == nil || p.Discovery.Kubernetes == nil {
				continue
			}
			f := fmt.Sprintf("deployments[%d].pools[%d].discovery.kubernetes", i, j)
			k := p.Discovery.Kubernetes
			if k.LabelSelector != "" {
				if _, err := labels.Parse(k.LabelSelector); err != nil {
					errs = append(errs, fmt.Errorf("%w: %s.label_selector: %q does not parse: %w", config.ErrConfig, f, k.LabelSelector, err))
				}
			}
			for _, l := range [][2]string{{"role_label", k.RoleLabel}, {"model_label", k.ModelLabel}} {
				if l[1] != "" {
					if _, err := labels.Parse(l[1]); err != nil || strings.ContainsAny(l[1], "=!(), ") {
						errs = append(errs, fmt.Errorf("%w: %s.%s: %q is not a label key", config.ErrConfig, f, l[0], l[1]))
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Configure (re)starts the informers the config's kubernetes pools need and
// stops those no pool needs any more. Watches shared by several pools (one
// Service feeding prefill and decode) run once.
func (s *Source) Configure(cfg *config.Config) error {
	if err := Check(cfg); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var pools []poolWatch
	need := map[watchKey]bool{}
	for i := range cfg.Deployments {
		d := &cfg.Deployments[i]
		for j := range d.Pools {
			p := &d.Pools[j]
			if p.Discovery == nil || p.Discovery.Kubernetes == nil {
				continue
			}
			k := *p.Discovery.Kubernetes
			pw := poolWatch{
				field: fmt.Sprintf("deployments[%d].pools[%d].discovery.kubernetes", i, j),
				pool:  config.PoolName(d.Name, p.Role), k: k, ns: k.Namespace,
				addrTyp: discoveryv1.AddressTypeIPv4,
			}
			if pw.ns == "" {
				pw.ns = s.opts.Namespace
			}
			if k.AddressType == "IPv6" {
				pw.addrTyp = discoveryv1.AddressTypeIPv6
			}
			if k.InferencePool != "" {
				s.configureInferencePool(&pw, need)
			} else {
				sel := k.LabelSelector
				if k.Service != "" {
					sel = serviceNameLabel + "=" + k.Service
				}
				key := watchKey{kind: kindSlices, ns: pw.ns, selector: sel}
				need[key] = true
				pw.slices = s.watchFor(key)
				if k.RoleLabel != "" || k.ModelLabel != "" {
					// Pods carrying every label the pool sorts by.
					var keys []string
					for _, l := range []string{k.RoleLabel, k.ModelLabel} {
						if l != "" && !slices.Contains(keys, l) {
							keys = append(keys, l)
						}
					}
					pkey := watchKey{kind: kindPods, ns: pw.ns, selector: strings.Join(keys, ",")}
					need[pkey] = true
					pw.pods = s.watchFor(pkey)
				}
			}
			if k.RoleLabel != "" {
				pw.roles = map[string]bool{}
				vals := k.RoleValues
				if len(vals) == 0 {
					vals = []string{p.Role}
				}
				for _, v := range vals {
					pw.roles[v] = true
				}
			}
			if k.ModelLabel != "" {
				pw.models = map[string]bool{}
				for _, m := range d.Models {
					pw.models[m] = true
				}
				if len(d.Models) == 0 {
					pw.models[d.Name] = true // Validate's default
				}
			}
			pools = append(pools, pw)
		}
	}
	for key, w := range s.watches {
		if !need[key] {
			close(w.stop)
			delete(s.watches, key)
			s.log.Info().Str(fieldNamespace, key.ns).Str(fieldSelector, key.selector).Msg("stopped watching " + key.kind)
		}
	}
	s.pools = pools
	clear(s.warned)
	go s.opts.Notify()
	return nil
}

// newWatch builds (does not run) an informer for key.
func (s *Source) newWatch(key watchKey) *watch {
	w := &watch{key: key, stop: make(chan struct{})}
	w.inf = s.opts.Client.informer(key.kind, key.ns, key.selector, func(err error) { w.missing.Store(apierrors.IsNotFound(err)) })
	switch key.kind {
	case kindPods:
		// Only what endpoints are made of is read: keep the cache small.
		_ = w.inf.SetTransform(slimPod)
	case kindInferencePools:
		_ = w.inf.SetTransform(toInferencePool)
	default:
		_ = w.inf.SetTransform(func(o any) (any, error) {
			if es, ok := o.(*discoveryv1.EndpointSlice); ok {
				es.ManagedFields = nil
				es.Annotations = nil
			}
			return o, nil
		})
	}
	_ = w.inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) { s.watchError(w, err) })
	_, _ = w.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.event(w) },
		UpdateFunc: func(any, any) { s.event(w) },
		DeleteFunc: func(any) { s.event(w) },
	})
	return w
}

// watchFor returns the running watch for key, starting it if needed.
// Called with s.mu held.
func (s *Source) watchFor(key watchKey) *watch {
	if w := s.watches[key]; w != nil {
		return w
	}
	w := s.newWatch(key)
	s.watches[key] = w
	s.log.Info().Str(fieldNamespace, key.ns).Str(fieldSelector, key.selector).Msg("watching " + key.kind)
	go w.inf.Run(w.stop)
	go func() {
		if cache.WaitForCacheSync(w.stop, w.inf.HasSynced) {
			s.log.Info().Str(fieldNamespace, key.ns).Str(fieldSelector, key.selector).
				Int("objects", len(w.inf.GetStore().ListKeys())).Msg(key.kind + " synced")
			s.opts.Notify()
		}
	}()
	return w
}

func (s *Source) event(w *watch) {
	if w.failed.Swap(false) {
		s.log.Info().Str(fieldNamespace, w.key.ns).Str(fieldSelector, w.key.selector).Msg("kubernetes API reachable again; " + w.key.kind + " resynced")
	}
	if w.key.kind == kindInferencePools {
		s.reselect()
	}
	s.opts.Notify()
}

// watchError logs list/watch failures: at once the first time, then at most
// every 30 s while they last. The informer keeps its last known objects and
// retries with backoff, so the endpoints stay as they were.
func (s *Source) watchError(w *watch, err error) {
	if w.notServed() {
		s.pollServed(w)
	}
	now := time.Now().UnixNano()
	first := !w.failed.Swap(true)
	if !first && now-w.errLog.Load() < int64(30*time.Second) {
		return
	}
	w.errLog.Store(now)
	l := s.log.With().Str(fieldNamespace, w.key.ns).Str(fieldSelector, w.key.selector).Logger()
	switch {
	case w.notServed():
		l.Warn().Err(err).Msg("the InferencePool CRD is not installed (" + InferencePoolGVR.GroupResource().String() + "/" + InferencePoolGVR.Version +
			" not served): pools with discovery.kubernetes.inference_pool stay empty; turnout follows them once it is installed")
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		l.Error().Err(err).Msg("kubernetes API denied list/watch of " + w.key.kind +
			": bind turnout's ServiceAccount to a Role with get/list/watch on them (deploy/kubernetes/rbac.yaml); " +
			"pools fed by it stay as last known (empty until the first list)")
	default:
		l.Warn().Err(err).Bool("synced", w.inf.HasSynced()).Msg("kubernetes watch of " + w.key.kind +
			" failed; keeping the last known endpoints and retrying")
	}
}

// Restart replaces every watch with a fresh one (after an API outage the
// informers' own retries may wait up to 30 s). The old watch keeps serving
// its last known objects until the new one has listed, so endpoints never
// blink; then Notify merges what changed meanwhile.
func (s *Source) Restart() {
	s.mu.Lock()
	var olds []*watch
	for _, w := range s.watches {
		if !w.restarting {
			w.restarting = true
			olds = append(olds, w)
		}
	}
	s.mu.Unlock()
	for _, old := range olds {
		go s.replace(old)
	}
}

// replace swaps a fresh watch in for old once it has listed (Restart).
func (s *Source) replace(old *watch) {
	nw := s.newWatch(old.key)
	go nw.inf.Run(nw.stop)
	if !cache.WaitForCacheSync(old.stop, nw.inf.HasSynced) {
		close(nw.stop) // the old watch was stopped (reconfigured) meanwhile
		return
	}
	s.mu.Lock()
	if s.watches[old.key] != old {
		s.mu.Unlock()
		close(nw.stop)
		return
	}
	s.watches[old.key] = nw
	for i := range s.pools {
		for _, p := range []**watch{&s.pools[i].slices, &s.pools[i].pods, &s.pools[i].ipool} {
			if *p == old {
				*p = nw
			}
		}
	}
	close(old.stop)
	s.mu.Unlock()
	s.log.Info().Str(fieldNamespace, old.key.ns).Str(fieldSelector, old.key.selector).
		Int("objects", len(nw.inf.GetStore().ListKeys())).Msg(old.key.kind + " resynced")
	if old.key.kind == kindInferencePools {
		s.reselect()
	}
	s.opts.Notify()
}

// Synced reports whether every watch has listed its objects once.
func (s *Source) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.watches {
		if !w.listed() && !w.reselected.Load() {
			return false
		}
	}
	return s.podsSelected()
}

// Failing counts the watches whose last list/watch failed (API unreachable,
// RBAC denied) with no event since: the turnout_discovery_watches_failing gauge.
func (s *Source) Failing() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.watches {
		if w.failed.Load() {
			n++
		}
	}
	return n
}

// Close stops every watch.
func (s *Source) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, w := range s.watches {
		close(w.stop)
		delete(s.watches, key)
	}
	s.pools = nil
}

// Endpoints returns each kubernetes pool's endpoints (by route.PoolName),
// sorted by name, from the informers' caches. A pool whose watches have not
// synced yet is left out (unknown, not empty).
func (s *Source) Endpoints() map[string][]config.EndpointConfig {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]config.EndpointConfig, len(s.pools))
	for i := range s.pools {
		pw := &s.pools[i]
		if pw.ipool != nil {
			if eps, known := s.inferencePoolEndpoints(pw); known {
				out[pw.pool] = eps
			}
			continue
		}
		if !pw.slices.inf.HasSynced() || (pw.pods != nil && !pw.pods.inf.HasSynced()) {
			continue
		}
		out[pw.pool] = s.poolEndpoints(pw)
	}
	return out
}

// Vanished reports the synced pools whose watch lists no EndpointSlice at
// all (the Service's slices were deleted, typically to be re-created), as
// opposed to slices that list no ready endpoint: the fleet keeps the former's
// last known endpoints for discovery.kubernetes.vanish_grace.
func (s *Source) Vanished() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for i := range s.pools {
		pw := &s.pools[i]
		if pw.ipool != nil {
			if s.inferencePoolVanished(pw) {
				out[pw.pool] = true
			}
			continue
		}
		if pw.slices.inf.HasSynced() && len(pw.slices.inf.GetStore().ListKeys()) == 0 {
			out[pw.pool] = true
		}
	}
	return out
}

// candidate is one endpoint of one slice.
type candidate struct {
	config.EndpointConfig
	slice string
}

// poolEndpoints turns a pool's slices into endpoints. Called with s.mu held.
func (s *Source) poolEndpoints(pw *poolWatch) []config.EndpointConfig {
	var cands []candidate
	for _, o := range pw.slices.inf.GetStore().List() {
		es, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		sl := es.Namespace + "/" + es.Name
		if es.AddressType != pw.addrTyp {
			// Dual-stack Services have one slice per family for the same pods.
			s.warnOnce("family/"+sl, func(l *zerolog.Event) {
				l.Str(fieldPool, pw.pool).Str(fieldSlice, sl).Str("address_type", string(es.AddressType)).
					Str(fieldReason, "pool uses "+string(pw.addrTyp)+" (discovery.kubernetes.address_type)").Msg("EndpointSlice skipped")
			})
			continue
		}
		port, ok := slicePort(es, pw.k.Port)
		if !ok {
			s.warnOnce("port/"+sl+"/"+es.ResourceVersion, func(l *zerolog.Event) {
				l.Str(fieldPool, pw.pool).Str(fieldSlice, sl).
					Str(fieldReason, fmt.Sprintf("no port %q (%s.port)", pw.k.Port, pw.field)).Msg("EndpointSlice skipped")
			})
			continue
		}
		for i := range es.Endpoints {
			e := &es.Endpoints[i]
			c := conditions(e.Conditions)
			if c == stateAbsent || len(e.Addresses) == 0 {
				continue
			}
			ip := net.ParseIP(e.Addresses[0])
			if ip == nil || (pw.addrTyp == discoveryv1.AddressTypeIPv4) != (ip.To4() != nil) {
				s.warnOnce("addr/"+sl+"/"+e.Addresses[0], func(l *zerolog.Event) {
					l.Str(fieldPool, pw.pool).Str(fieldSlice, sl).Str("address", e.Addresses[0]).
						Str(fieldReason, "not an "+string(pw.addrTyp)+" address").Msg("endpoint skipped")
				})
				continue
			}
			var model string
			if pw.pods != nil {
				var ok bool
				if model, ok = s.podMatches(pw, es.Namespace, e.TargetRef); !ok {
					continue
				}
			}
			name := endpointName(es.Namespace, e.TargetRef, ip, port)
			ec := config.EndpointConfig{
				Name: name, Address: net.JoinHostPort(ip.String(), strconv.Itoa(port)),
				Draining: c == stateDraining, Discovered: true,
			}
			if model != "" {
				ec.Models = []string{model}
			}
			cands = append(cands, candidate{slice: sl, EndpointConfig: ec})
		}
	}
	return s.dedupe(pw, cands)
}

// dedupe keeps one endpoint per name and per address. The same pod in two
// slices (the controller moving it) is one endpoint, available if either
// copy says so; two names on one address is a conflict: the available one,
// then the smaller name, wins, and the conflict is logged.
func (s *Source) dedupe(pw *poolWatch, cands []candidate) []config.EndpointConfig {
	better := func(a, b *candidate) bool {
		if a.Draining != b.Draining {
			return !a.Draining
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.slice < b.slice
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		if better(&a, &b) {
			return -1
		}
		if better(&b, &a) {
			return 1
		}
		return 0
	})
	byName := map[string]bool{}
	byAddr := map[string]string{}
	out := make([]config.EndpointConfig, 0, len(cands))
	for i := range cands {
		c := &cands[i]
		if byName[c.Name] {
			continue
		}
		if other, ok := byAddr[c.Address]; ok {
			s.warnOnce("dup/"+c.Address+"/"+c.Name, func(l *zerolog.Event) {
				l.Str(fieldPool, pw.pool).Str(fieldSlice, c.slice).Str("address", c.Address).Str("endpoint", c.Name).
					Str(fieldReason, "address already used by "+other).Msg("duplicate address skipped")
			})
			continue
		}
		byName[c.Name] = true
		byAddr[c.Address] = c.Name
		out = append(out, c.EndpointConfig)
	}
	slices.SortFunc(out, func(a, b config.EndpointConfig) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// podMatches reports whether the endpoint's pod carries one of the pool's
// role label values (role_label) and serves one of the deployment's models
// (model_label), and which model. An endpoint whose pod is not known (yet)
// is left out: nothing is routed to a half-known endpoint.
func (s *Source) podMatches(pw *poolWatch, ns string, ref *corev1.ObjectReference) (model string, ok bool) {
	if ref == nil || ref.Kind != "Pod" {
		return "", false
	}
	if ref.Namespace != "" {
		ns = ref.Namespace
	}
	o, ok, err := pw.pods.inf.GetStore().GetByKey(ns + "/" + ref.Name)
	if err != nil || !ok {
		return "", false
	}
	p, ok := o.(*corev1.Pod)
	if !ok {
		return "", false
	}
	return podLabelsMatch(pw, p)
}

// podLabelsMatch reports whether pod p carries one of the pool's role label
// values (role_label) and serves one of the deployment's models
// (model_label), and which model.
func podLabelsMatch(pw *poolWatch, p *corev1.Pod) (model string, ok bool) {
	if pw.roles != nil && !pw.roles[p.Labels[pw.k.RoleLabel]] {
		return "", false
	}
	if pw.models == nil {
		return "", true
	}
	v, has := p.Labels[pw.k.ModelLabel]
	if m, mapped := pw.k.ModelValues[v]; mapped {
		v = m
	}
	return v, has && pw.models[v]
}

func (s *Source) warnOnce(key string, msg func(*zerolog.Event)) {
	if s.warned[key] {
		return
	}
	if len(s.warned) > 4096 {
		clear(s.warned)
	}
	s.warned[key] = true
	msg(s.log.Warn())
}

// Endpoint states derived from EndpointSlice conditions.
const (
	stateAbsent = iota
	stateReady
	stateDraining
)

// conditions maps EndpointSlice conditions: ready -> available; serving and
// terminating -> draining; anything else is not an endpoint. A nil ready or
// serving means "unknown", which the API says to read as ready.
func conditions(c discoveryv1.EndpointConditions) int {
	ready := c.Ready == nil || *c.Ready
	serving := ready
	if c.Serving != nil {
		serving = *c.Serving
	}
	terminating := c.Terminating != nil && *c.Terminating
	switch {
	case terminating && serving:
		return stateDraining
	case terminating:
		return stateAbsent
	case ready:
		return stateReady
	}
	return stateAbsent
}

// slicePort finds the configured port (name or number; "" = the only one).
func slicePort(es *discoveryv1.EndpointSlice, want string) (int, bool) {
	if n, err := strconv.Atoi(want); err == nil {
		for _, p := range es.Ports {
			if p.Port != nil && int(*p.Port) == n {
				return n, true
			}
		}
		return 0, false
	}
	if want == "" {
		if len(es.Ports) == 1 && es.Ports[0].Port != nil {
			return int(*es.Ports[0].Port), true
		}
		return 0, false
	}
	for _, p := range es.Ports {
		if p.Name != nil && *p.Name == want && p.Port != nil {
			return int(*p.Port), true
		}
	}
	return 0, false
}

// endpointName is the server name of an endpoint: the pod's name (stable
// across turnout restarts; what operators see in kubectl), or, for names
// the server-name rule refuses, a cut name plus a hash of the full one.
// Endpoints without a pod are named after their address.
func endpointName(ns string, ref *corev1.ObjectReference, ip net.IP, port int) string {
	if ref == nil || ref.Name == "" {
		return "ep-" + strings.NewReplacer(".", "-", ":", "-").Replace(ip.String()) + "-" + strconv.Itoa(port)
	}
	if config.ValidName(ref.Name) {
		return ref.Name
	}
	return HashedName(ns + "/" + ref.Name)
}

// HashedName shortens or cleans a name for the server-name rule: up to 46
// kept characters, '-', 16 hex digits of the full name's hash.
func HashedName(full string) string { return hashedName(full, 46) }

// hashedName is HashedName keeping up to keep characters.
func hashedName(full string, keep int) string {
	b := make([]byte, 0, 63)
	for i := 0; i < len(full) && len(b) < keep; i++ {
		c := full[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
			b = append(b, c)
		case c == '/':
			b = append(b, '.')
		}
	}
	if len(b) == 0 || !isAlnum(b[0]) {
		b = append([]byte{'k'}, b...)
	}
	return string(b) + "-" + strconv.FormatUint(xxhash.Sum64String(full), 16)
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// Probe lists each watched kind once (limit 1), so a missing permission or
// an unreachable API is reported at start, not after the first backoff.
func (s *Source) Probe(ctx context.Context) error {
	s.mu.Lock()
	keys := make([]watchKey, 0, len(s.watches))
	for k := range s.watches {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	var errs []error
	for _, k := range keys {
		o := metav1.ListOptions{LabelSelector: k.selector, Limit: 1}
		if _, err := s.opts.Client.list(ctx, k.kind, k.ns, o); err != nil {
			if k.kind == kindInferencePools && apierrors.IsNotFound(err) {
				err = fmt.Errorf("the InferencePool CRD (%s/%s) is not installed: %w", InferencePoolGVR.GroupResource(), InferencePoolGVR.Version, err)
			}
			errs = append(errs, fmt.Errorf("list %s in namespace %s (%s): %w", k.kind, k.ns, k.selector, err))
		}
	}
	return errors.Join(errs...)
}

// APIHealth notices an unreachable API server from the client's own
// requests (informers retry a refused watch quietly, without calling the
// watch error handler, and back off up to 30 s): the first failure is
// logged, then the API's /readyz (open to every authenticated user) is
// probed every second, and when it answers the recovery is logged and
// OnRecover runs (Source.Restart: fresh watches, no 30 s backoff left).
// Install it with Wrap before building the Client.
type APIHealth struct {
	log   *zerolog.Logger
	down  atomic.Bool
	since atomic.Int64 // unix nanos of the first failure
	// Probe and OnRecover are set by Run.
	probe     func(context.Context) error
	onRecover func()
	ctx       context.Context
}

// NewAPIHealth returns an APIHealth logging to log.
func NewAPIHealth(log *zerolog.Logger) *APIHealth {
	if log == nil {
		l := zerolog.Nop()
		log = &l
	}
	return &APIHealth{log: log}
}

// Down reports whether the API server is unreachable.
func (h *APIHealth) Down() bool { return h.down.Load() }

// Wrap makes rc's transport report to h.
func (h *APIHealth) Wrap(rc *rest.Config) {
	prev := rc.WrapTransport
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return healthRT{h: h, next: rt}
	}
}

// Start enables probing during outages (until ctx ends) and the recovery
// hook; call it once, before the first request.
func (h *APIHealth) Start(ctx context.Context, c *Client, onRecover func()) {
	h.ctx, h.onRecover = ctx, onRecover
	h.probe = c.readyz
}

type healthRT struct {
	h    *APIHealth
	next http.RoundTripper
}

func (r healthRT) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := r.next.RoundTrip(req)
	switch {
	case err != nil && req.Context().Err() == nil:
		r.h.failed(req, err)
	case err == nil && res.StatusCode < 500:
		r.h.ok()
	}
	return res, err
}

func (h *APIHealth) failed(req *http.Request, err error) {
	if h.down.Swap(true) {
		return
	}
	h.since.Store(time.Now().UnixNano())
	h.log.Warn().Err(err).Str("host", req.URL.Host).
		Msg("kubernetes API unreachable; keeping the last known endpoints and retrying")
	if h.probe != nil {
		go h.probeLoop()
	}
}

// probeLoop asks /readyz every second while the API is down.
func (h *APIHealth) probeLoop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for h.down.Load() {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(h.ctx, 2*time.Second)
		_ = h.probe(ctx) // a success goes through RoundTrip: ok()
		cancel()
	}
}

func (h *APIHealth) ok() {
	if !h.down.Swap(false) {
		return
	}
	h.log.Info().Dur("outage", time.Since(time.Unix(0, h.since.Load()))).
		Msg("kubernetes API reachable again; restarting the watches to resync")
	if h.onRecover != nil {
		go h.onRecover()
	}
}
