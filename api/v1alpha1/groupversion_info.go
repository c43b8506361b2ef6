// Package v1alpha1 contains the redline.dev/v1alpha1 API: RateLimitPolicy.
// +kubebuilder:object:generate=true
// +groupName=redline.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "redline.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this API's types with a scheme. Only apimachinery is imported,
	// so clients can use the types without controller-runtime.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &RateLimitPolicy{}, &RateLimitPolicyList{}, &RedisBackend{}, &RedisBackendList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
