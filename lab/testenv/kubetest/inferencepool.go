package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// InferencePoolCRD is the InferencePool CRD manifest, relative to the repository root.
const InferencePoolCRD = "deploy/testdata/crds/inference.networking.k8s.io_inferencepools.yaml"

// InferencePoolGVR is the InferencePool resource.
var InferencePoolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// InferencePoolRule is what the chart's Role adds for pools with
// discovery.kubernetes.inference_pool (deploy/chart_rbac_test.go checks
// the chart grants it); pods are granted by the Role already.
var InferencePoolRule = rbacv1.PolicyRule{
	APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"},
	Verbs: []string{"get", "list", "watch"},
}

// Dynamic is a dynamic client authenticating with the admin token.
func (c *Cluster) Dynamic() dynamic.Interface {
	c.t.Helper()
	d, err := dynamic.NewForConfig(c.RESTConfig(AdminToken))
	if err != nil {
		c.t.Fatal(err)
	}
	return d
}

// GrantInferencePools binds turnout's ServiceAccount to a Role with
// InferencePoolRule in the cluster's namespace.
func (c *Cluster) GrantInferencePools() {
	c.t.Helper()
	ctx := context.Background()
	name := "turnout-inferencepools"
	if _, err := c.Admin.RbacV1().Roles(c.Namespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{InferencePoolRule},
	}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.Admin.RbacV1().RoleBindings(c.Namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ServiceAccount, Namespace: c.Namespace}},
	}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// InstallInferencePoolCRD applies InferencePoolCRD (repoRoot) and waits
// until InferencePools are served.
func (c *Cluster) InstallInferencePoolCRD(repoRoot string) {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, InferencePoolCRD))
	if err != nil {
		c.t.Fatal(err)
	}
	a, err := NewApplier(c, false)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := a.Apply(context.Background(), bytes.NewReader(b)); err != nil {
		c.t.Fatalf("%s: %v", InferencePoolCRD, err)
	}
	d := c.Dynamic()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := d.Resource(InferencePoolGVR).Namespace(c.Namespace).List(context.Background(), metav1.ListOptions{Limit: 1})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("InferencePools not served 30s after applying the CRD: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// InferencePool is an InferencePool object selecting matchLabels on ports.
func (c *Cluster) InferencePool(name string, matchLabels map[string]string, ports ...int) *unstructured.Unstructured {
	ml := map[string]any{}
	for k, v := range matchLabels {
		ml[k] = v
	}
	tp := make([]any, 0, len(ports))
	for _, p := range ports {
		tp = append(tp, map[string]any{"number": int64(p)})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": InferencePoolGVR.GroupVersion().String(), "kind": "InferencePool",
		"metadata": map[string]any{"name": name, "namespace": c.Namespace},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": ml},
			"targetPorts":       tp,
			"endpointPickerRef": map[string]any{"name": name + "-epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
}

// PutInferencePool creates or replaces the InferencePool name.
func (c *Cluster) PutInferencePool(name string, matchLabels map[string]string, ports ...int) error {
	ctx := context.Background()
	api := c.Dynamic().Resource(InferencePoolGVR).Namespace(c.Namespace)
	o := c.InferencePool(name, matchLabels, ports...)
	cur, err := api.Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		o.SetResourceVersion(cur.GetResourceVersion())
		_, err = api.Update(ctx, o, metav1.UpdateOptions{})
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, o, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("InferencePool %s: %w", name, err)
	}
	return nil
}

// DeleteInferencePool deletes the InferencePool name.
func (c *Cluster) DeleteInferencePool(name string) error {
	err := c.Dynamic().Resource(InferencePoolGVR).Namespace(c.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil {
		return fmt.Errorf("delete InferencePool %s: %w", name, err)
	}
	return nil
}

// PodNode is the node test pods are bound to: a bound pod is deleted
// gracefully (it stays, terminating, until ForceDeletePod), as on a
// kubelet's node; no node object or kubelet is needed for that.
const PodNode = "node-0"

// PutPod creates pod name (bound to PodNode) with labels, or updates its
// labels, and sets its status: Running with ip, Ready as ready ("" ip: no
// address yet).
func (c *Cluster) PutPod(name string, labels map[string]string, ip string, ready bool) error {
	ctx := context.Background()
	api := c.Admin.CoreV1().Pods(c.Namespace)
	p, err := api.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		f := false
		p, err = api.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: PodNode, AutomountServiceAccountToken: &f,
				Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}},
		}, metav1.CreateOptions{})
	case err == nil:
		p.Labels = labels
		p, err = api.Update(ctx, p, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("pod %s: %w", name, err)
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}
	if ip != "" {
		p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	}
	if _, err := api.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("pod %s status: %w", name, err)
	}
	return nil
}

// DeletePod starts a graceful deletion: the pod stays, terminating.
func (c *Cluster) DeletePod(name string) error {
	if err := c.Admin.CoreV1().Pods(c.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	return nil
}

// ForceDeletePod removes the pod at once (what the kubelet confirms at the
// end of a graceful deletion).
func (c *Cluster) ForceDeletePod(name string) error {
	var zero int64
	err := c.Admin.CoreV1().Pods(c.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("force delete pod %s: %w", name, err)
	}
	return nil
}
