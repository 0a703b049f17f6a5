package kube

import (
	"context"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// servedPoll is how often a resource found not served (the InferencePool
// CRD not installed) is asked for again; the informer's own retries back
// off to 30 s.
const servedPoll = 2 * time.Second

// configureInferencePool sets up a pool following an InferencePool: one
// watch of the namespace's InferencePools (shared by every pool there) and,
// once the pool's selector is known, one of the pods it selects. Called
// from Configure with s.mu held.
func (s *Source) configureInferencePool(pw *poolWatch, need map[watchKey]bool) {
	key := watchKey{kind: kindInferencePools, ns: pw.ns}
	need[key] = true
	pw.ipool = s.watchFor(key)
	if pkey, ok := s.podsKey(pw); ok {
		need[pkey] = true
		pw.pods = s.watchFor(pkey)
	}
}

// inferencePool returns the pool's InferencePool as cached, nil when the
// watch has not listed it (absent, CRD missing, not synced).
func (pw *poolWatch) inferencePool() *inferencePool {
	o, ok, err := pw.ipool.inf.GetStore().GetByKey(pw.ns + "/" + pw.k.InferencePool)
	if err != nil || !ok {
		return nil
	}
	ip, _ := o.(*inferencePool)
	return ip
}

// podsKey is the pod watch the pool's InferencePool selects, if it is
// known and valid.
func (s *Source) podsKey(pw *poolWatch) (watchKey, bool) {
	ip := pw.inferencePool()
	if ip == nil || ip.Invalid != "" {
		return watchKey{}, false
	}
	return watchKey{kind: kindPods, ns: pw.ns, selector: ip.podSelector()}, true
}

// reselect follows InferencePool selector changes: a pool whose selector
// changed gets the pod watch of the new one, and watches no pool uses any
// more stop. A pool that disappeared keeps its last pod watch (re-created
// with the same selector, it is ready at once).
func (s *Source) reselect() {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for i := range s.pools {
		pw := &s.pools[i]
		if pw.ipool == nil {
			continue
		}
		key, ok := s.podsKey(pw)
		if !ok || (pw.pods != nil && pw.pods.key == key) {
			continue
		}
		ev := s.log.Info().Str(fieldPool, pw.pool).Str(fieldNamespace, pw.ns).Str("inference_pool", pw.k.InferencePool).Str(fieldSelector, key.selector)
		if pw.pods != nil {
			ev = ev.Str("previous", pw.pods.key.selector)
		}
		ev.Msg("InferencePool selects pods")
		_, running := s.watches[key]
		nw := s.watchFor(key)
		if pw.pods != nil && !running {
			nw.reselected.Store(true)
		}
		pw.pods = nw
		changed = true
	}
	if !changed {
		return
	}
	used := map[*watch]bool{}
	for i := range s.pools {
		used[s.pools[i].slices], used[s.pools[i].pods], used[s.pools[i].ipool] = true, true, true
	}
	for key, w := range s.watches {
		if !used[w] {
			close(w.stop)
			delete(s.watches, key)
			s.log.Info().Str(fieldNamespace, key.ns).Str(fieldSelector, key.selector).Msg("stopped watching " + key.kind)
		}
	}
}

// podsSelected: every pool following a (valid) InferencePool has a pod
// watch, so Synced does not report a fleet whose pods are not even asked
// for yet. Called with s.mu held.
func (s *Source) podsSelected() bool {
	for i := range s.pools {
		if pw := &s.pools[i]; pw.ipool != nil && pw.pods == nil {
			if ip := pw.inferencePool(); ip != nil && ip.Invalid == "" {
				return false
			}
		}
	}
	return true
}

// inferencePoolEndpoints are the endpoints of a pool following an
// InferencePool; known is false while they cannot be told yet (watches not
// listed, a new selector's pods not listed), so the fleet keeps what it
// had. Called with s.mu held.
func (s *Source) inferencePoolEndpoints(pw *poolWatch) (eps []config.EndpointConfig, known bool) {
	name := pw.ns + "/" + pw.k.InferencePool
	if pw.ipool.notServed() {
		return nil, true // watchError says why
	}
	if !pw.ipool.inf.HasSynced() {
		return nil, false
	}
	ip := pw.inferencePool()
	if ip == nil {
		s.warnOnce("ipool-absent/"+name, func(l *zerolog.Event) {
			l.Str(fieldPool, pw.pool).Str("inference_pool", name).
				Str(fieldReason, "no such InferencePool (yet); the pool follows it once it is created").Msg("pool empty")
		})
		return nil, true
	}
	if ip.Invalid != "" {
		s.warnOnce("ipool-invalid/"+name+"/"+ip.ResourceVersion, func(l *zerolog.Event) {
			l.Str(fieldPool, pw.pool).Str("inference_pool", name).Str(fieldReason, ip.Invalid).Msg("InferencePool not followed; pool empty")
		})
		return nil, true
	}
	if pw.pods == nil || pw.pods.key.selector != ip.podSelector() || !pw.pods.inf.HasSynced() {
		return nil, false
	}
	var cands []candidate
	for _, o := range pw.pods.inf.GetStore().List() {
		p, ok := o.(*corev1.Pod)
		if !ok || conditions(podConditions(p)) == stateAbsent {
			continue
		}
		addr := s.podIP(pw, p)
		if addr == nil {
			continue
		}
		model, ok := podLabelsMatch(pw, p)
		if !ok {
			continue
		}
		draining := conditions(podConditions(p)) == stateDraining
		for rank, port := range ip.Ports {
			ec := config.EndpointConfig{
				Name:     rankName(p.Namespace, p.Name, rank, len(ip.Ports)),
				Address:  net.JoinHostPort(addr.String(), strconv.Itoa(port)),
				Draining: draining, Discovered: true,
			}
			if model != "" {
				ec.Models = []string{model}
			}
			cands = append(cands, candidate{EndpointConfig: ec, slice: "pod/" + p.Namespace + "/" + p.Name})
		}
	}
	return s.dedupe(pw, cands), true
}

// inferencePoolVanished: the CRD is not served, the InferencePool is gone,
// or it selects no pod at all (as opposed to pods that are not ready).
// Called with s.mu held.
func (s *Source) inferencePoolVanished(pw *poolWatch) bool {
	if pw.ipool.notServed() {
		return true
	}
	if !pw.ipool.inf.HasSynced() {
		return false
	}
	ip := pw.inferencePool()
	if ip == nil {
		return true
	}
	return ip.Invalid == "" && pw.pods != nil && pw.pods.key.selector == ip.podSelector() &&
		pw.pods.inf.HasSynced() && len(pw.pods.inf.GetStore().ListKeys()) == 0
}

// podConditions derives a pod's endpoint conditions as the EndpointSlice
// controller does, so both sources share one rule (conditions): serving is
// the Ready condition, terminating is a deletion in progress, and a pod
// that has finished (Succeeded, Failed) serves nothing.
func podConditions(p *corev1.Pod) discoveryv1.EndpointConditions {
	ready := false
	if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				ready = c.Status == corev1.ConditionTrue
			}
		}
	}
	deleting := p.DeletionTimestamp != nil
	return discoveryv1.EndpointConditions{Ready: ptrTo(ready && !deleting), Serving: ptrTo(ready), Terminating: ptrTo(deleting)}
}

func ptrTo[T any](v T) *T { return &v }

// podIP is the pod's address of the pool's family, nil without one (not
// scheduled yet: quietly absent; only the other family: logged).
func (s *Source) podIP(pw *poolWatch, p *corev1.Pod) net.IP {
	ips := make([]string, 0, 2)
	for _, a := range p.Status.PodIPs {
		ips = append(ips, a.IP)
	}
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = append(ips, p.Status.PodIP)
	}
	for _, a := range ips {
		if ip := net.ParseIP(a); ip != nil && (pw.addrTyp == discoveryv1.AddressTypeIPv4) == (ip.To4() != nil) {
			return ip
		}
	}
	if len(ips) > 0 {
		s.warnOnce("podip/"+p.Namespace+"/"+p.Name+"/"+p.ResourceVersion, func(l *zerolog.Event) {
			l.Str(fieldPool, pw.pool).Str("pod", p.Namespace+"/"+p.Name).Strs("ips", ips).
				Str(fieldReason, "no "+string(pw.addrTyp)+" address (discovery.kubernetes.address_type)").Msg("pod skipped")
		})
	}
	return nil
}

// rankName names the endpoint of a pod's data-parallel rank: the pod's
// name when the pool has one target port (as EndpointSlice discovery names
// it), else the pod's name and "_rank" with the rank's index in
// spec.targetPorts ('_' never occurs in pod names, so no other pod's name
// collides). Too long or odd names are cut and hashed, keeping the rank.
func rankName(ns, pod string, rank, ranks int) string {
	if ranks == 1 {
		return endpointName(ns, &corev1.ObjectReference{Name: pod}, nil, 0)
	}
	suffix := "_rank" + strconv.Itoa(rank)
	if n := pod + suffix; config.ValidName(n) {
		return n
	}
	return hashedName(ns+"/"+pod, 46-len(suffix)) + suffix
}

// slimPod keeps what endpoints are made of: name, labels, deletion, phase,
// addresses and the Ready condition.
func slimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
	if i := slices.IndexFunc(p.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady }); i >= 0 {
		out.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: p.Status.Conditions[i].Status}}
	}
	return out, nil
}

// notServed: the last list found the resource not served (the
// InferencePool CRD is not installed).
func (w *watch) notServed() bool {
	return w.key.kind == kindInferencePools && w.missing.Load()
}

// listed: the watch has listed its objects, or learnt that its resource is
// not served (then it holds none, and the proxies may follow the rest).
func (w *watch) listed() bool { return w.inf.HasSynced() || w.notServed() }

// pollServed asks every servedPoll whether w's resource is served now, and
// then swaps a fresh watch in (the informer's own retry may be 30 s away).
func (s *Source) pollServed(w *watch) {
	if w.polling.Swap(true) {
		return
	}
	go func() {
		t := time.NewTicker(servedPoll)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			if !w.notServed() {
				w.polling.Store(false)
				return // the informer's own retry listed it
			}
			ctx, cancel := context.WithTimeout(context.Background(), servedPoll)
			_, err := s.opts.Client.list(ctx, w.key.kind, w.key.ns, metav1.ListOptions{LabelSelector: w.key.selector, Limit: 1})
			cancel()
			if err == nil {
				s.log.Info().Str(fieldNamespace, w.key.ns).Msg(w.key.kind + " served now; watching them")
				s.replace(w)
				return
			}
		}
	}()
}
