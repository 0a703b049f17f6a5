package kube

import (
	"fmt"
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// InferencePoolGVR is the Gateway API Inference Extension's InferencePool
// resource (deploy/testdata/crds/inference.networking.k8s.io_inferencepools.yaml).
var InferencePoolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// maxTargetPorts bounds spec.targetPorts as the CRD does.
const maxTargetPorts = 8

// inferencePool is what discovery reads of an InferencePool: its
// selector and target ports (the endpoint picker reference is another
// component's business). The informer's cache holds these, not the
// unstructured objects.
type inferencePool struct {
	metav1.ObjectMeta
	// Selector is spec.selector.matchLabels.
	Selector map[string]string
	// Ports are spec.targetPorts[].number, one per data-parallel rank.
	Ports []int
	// Invalid says why the spec cannot be followed ("" = it can); the API
	// server's schema refuses most of these, a CRD without one does not.
	Invalid string
}

// inferencePoolJSON is the part of the v1 API read here.
type inferencePoolJSON struct {
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		TargetPorts []struct {
			Number int `json:"number"`
		} `json:"targetPorts"`
	} `json:"spec"`
}

// toInferencePool converts an unstructured InferencePool (what the dynamic
// client lists and watches) into the cached form. A spec that does not
// convert or validate is kept, marked Invalid, so the pool empties with a
// logged reason instead of following half of it.
func toInferencePool(o any) (any, error) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		// Tombstones (cache.DeletedFinalStateUnknown) hold a converted object.
		return o, nil
	}
	ip := &inferencePool{ObjectMeta: metav1.ObjectMeta{
		Name: u.GetName(), Namespace: u.GetNamespace(), UID: u.GetUID(),
		ResourceVersion: u.GetResourceVersion(), DeletionTimestamp: u.GetDeletionTimestamp(),
	}}
	var raw inferencePoolJSON
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &raw); err != nil {
		ip.Invalid = "spec does not decode: " + err.Error()
		return ip, nil
	}
	ip.Selector = maps.Clone(raw.Spec.Selector.MatchLabels)
	for _, p := range raw.Spec.TargetPorts {
		ip.Ports = append(ip.Ports, p.Number)
	}
	ip.Invalid = ip.validate()
	return ip, nil
}

// validate checks what discovery relies on.
func (ip *inferencePool) validate() string {
	switch {
	case len(ip.Ports) == 0:
		return "spec.targetPorts is empty"
	case len(ip.Ports) > maxTargetPorts:
		return fmt.Sprintf("spec.targetPorts has %d entries, at most %d", len(ip.Ports), maxTargetPorts)
	case len(ip.Selector) == 0:
		// As for a Service: an empty selector selects no pod, not every pod.
		return "spec.selector.matchLabels is empty: it selects no pod"
	}
	seen := map[int]bool{}
	for i, p := range ip.Ports {
		if p < 1 || p > 65535 {
			return fmt.Sprintf("spec.targetPorts[%d].number %d is out of range", i, p)
		}
		if seen[p] {
			return fmt.Sprintf("spec.targetPorts[%d].number %d is listed twice", i, p)
		}
		seen[p] = true
	}
	for k, v := range ip.Selector {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Sprintf("spec.selector.matchLabels key %q: %s", k, errs[0])
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Sprintf("spec.selector.matchLabels[%s] value %q: %s", k, v, errs[0])
		}
	}
	return ""
}

// podSelector is the label selector of the pool's pods (valid pools only).
func (ip *inferencePool) podSelector() string {
	return labels.SelectorFromSet(ip.Selector).String()
}

// DeepCopyObject lets the informer's cache hold inferencePools.
func (ip *inferencePool) DeepCopyObject() runtime.Object {
	c := *ip
	ip.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.Selector = maps.Clone(ip.Selector)
	c.Ports = append([]int(nil), ip.Ports...)
	return &c
}

// GetObjectKind: the cached form carries no type meta.
func (ip *inferencePool) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

var _ runtime.Object = (*inferencePool)(nil)
