package kube

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Client is all of the Kubernetes API the source uses: list and watch of
// EndpointSlices (discovery.k8s.io/v1), Pods (v1) and, through the dynamic
// client, InferencePools (inference.networking.k8s.io/v1), and the API
// server's /readyz. It is client-go's REST client with just these types registered,
// not the generated clientset (kubernetes.NewForConfig), whose scheme and
// typed clients link every API group: about 36 MB of turnout's binary.
type Client struct {
	slices, core *rest.RESTClient
	dyn          dynamic.Interface
}

// NewClient builds a Client from rc (RESTConfig); both API groups share
// one HTTP client, so rc's transport wrappers (APIHealth.Wrap) see every
// request.
func NewClient(rc *rest.Config) (*Client, error) {
	sch := runtime.NewScheme()
	// Status (API errors), WatchEvent and the list options.
	metav1.AddToGroupVersion(sch, schema.GroupVersion{Version: "v1"})
	if err := discoveryv1.AddToScheme(sch); err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	if err := corev1.AddToScheme(sch); err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	codecs := serializer.NewCodecFactory(sch).WithoutConversion()
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	group := func(apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
		c := rest.CopyConfig(rc)
		c.APIPath, c.GroupVersion, c.NegotiatedSerializer = apiPath, &gv, codecs
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		rcl, err := rest.RESTClientForConfigAndClient(c, hc)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client %s: %w", gv, err)
		}
		return rcl, nil
	}
	cl := &Client{}
	if cl.slices, err = group("/apis", discoveryv1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if cl.core, err = group("/api", corev1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if cl.dyn, err = dynamic.NewForConfigAndClient(rest.CopyConfig(rc), hc); err != nil {
		return nil, fmt.Errorf("kubernetes client %s: %w", InferencePoolGVR.GroupVersion(), err)
	}
	return cl, nil
}

// Kinds the source watches (watchKey.kind).
const (
	kindSlices         = "endpointslices"
	kindPods           = "pods"
	kindInferencePools = "inferencepools"
)

func (c *Client) rest(kind string) *rest.RESTClient {
	if kind == kindPods {
		return c.core
	}
	return c.slices
}

// list lists kind in ns.
func (c *Client) list(ctx context.Context, kind, ns string, o metav1.ListOptions) (runtime.Object, error) {
	if kind == kindInferencePools {
		l, err := c.dyn.Resource(InferencePoolGVR).Namespace(ns).List(ctx, o)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	var out runtime.Object = &discoveryv1.EndpointSliceList{}
	if kind == kindPods {
		out = &corev1.PodList{}
	}
	err := c.rest(kind).Get().Namespace(ns).Resource(kind).VersionedParams(&o, metav1.ParameterCodec).
		Timeout(timeout(o)).Do(ctx).Into(out)
	return out, err
}

// watch watches kind in ns.
func (c *Client) watch(ctx context.Context, kind, ns string, o metav1.ListOptions) (apiwatch.Interface, error) {
	if kind == kindInferencePools {
		return c.dyn.Resource(InferencePoolGVR).Namespace(ns).Watch(ctx, o)
	}
	o.Watch = true
	return c.rest(kind).Get().Namespace(ns).Resource(kind).VersionedParams(&o, metav1.ParameterCodec).
		Timeout(timeout(o)).Watch(ctx)
}

// timeout is the request's own bound, as the generated clients set it.
func timeout(o metav1.ListOptions) time.Duration {
	if o.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*o.TimeoutSeconds) * time.Second
}

// informer is a shared informer for kind in ns, filtered by selector, as
// client-go's informer factory (dynamicinformer for InferencePools) would
// build it; listed (if not nil) sees each list's outcome.
func (c *Client) informer(kind, ns, selector string, listed func(error)) cache.SharedIndexInformer {
	var obj runtime.Object = &discoveryv1.EndpointSlice{}
	switch kind {
	case kindPods:
		obj = &corev1.Pod{}
	case kindInferencePools:
		obj = &unstructured.Unstructured{}
	}
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			out, err := c.list(context.TODO(), kind, ns, o)
			if listed != nil {
				listed(err)
			}
			return out, err
		},
		WatchFunc: func(o metav1.ListOptions) (apiwatch.Interface, error) {
			o.LabelSelector = selector
			return c.watch(context.TODO(), kind, ns, o)
		},
	}
	return cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// readyz asks the API server whether it is ready.
func (c *Client) readyz(ctx context.Context) error {
	_, err := c.core.Get().AbsPath("/readyz").DoRaw(ctx)
	return err
}
