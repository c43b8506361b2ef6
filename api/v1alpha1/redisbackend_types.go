package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RedisBackendSpec names a Redis of its own for the namespaces it selects.
type RedisBackendSpec struct {
	// url is the Redis the selected namespaces' sidecars and the manager use for them:
	// redis://host:port, rediss://host:port (TLS), redis://h1:p,h2:p,h3:p (a cluster) or
	// redis+sentinel://s1:p,s2:p/master (rediss+sentinel:// over TLS). It carries no credentials: every pod of a selected
	// namespace is given this URL, and the admin's password goes in credentialsSecret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^(redis|rediss)(\+sentinel)?://[^@\s]+$`
	// +required
	URL string `json:"url"`

	// credentialsSecret is the name of a Secret in the manager's namespace holding the admin's
	// credentials for this Redis: key "password" (its default user's, or username's), and
	// optionally "username", and with Sentinel "sentinel-username" and "sentinel-password".
	// Tenants never receive it: each namespace gets a Redis user of its own on this backend.
	// Empty: a Redis without a password (then nothing isolates its tenants).
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`

	// namespaceSelector selects the namespaces this backend serves, by the Namespace
	// objects' labels, which only whoever may update Namespaces (not a namespace's tenant)
	// sets. kubernetes.io/metadata.name, which the API server sets to the namespace's name and
	// nobody can change, names namespaces one by one. A namespace selected by several backends
	// is served by the oldest. It must select something: an empty selector is refused.
	// +required
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`

	// tls, with a rediss:// URL, is what this Redis's certificates must carry. The manager
	// verifies them with its own CA bundle and presents its own client certificate
	// (--redis-tls-*); sidecars with their namespace's TLS Secret (--sidecar-redis-tls-secret).
	// +optional
	TLS *RedisBackendTLS `json:"tls,omitempty"`

	// maxClients is this Redis's maxclients, for a Redis that refuses CONFIG GET (managed
	// services); 0 reads it with CONFIG GET.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxClients int64 `json:"maxClients,omitempty"`
}

// RedisBackendTLS is what a backend's certificates must carry.
type RedisBackendTLS struct {
	// serverName is the name every node's certificate must carry (empty: the host each
	// connection dials).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ServerName string `json:"serverName,omitempty"`
	// minVersion is the oldest TLS version accepted (empty: 1.2).
	// +kubebuilder:validation:Enum="1.2";"1.3"
	// +optional
	MinVersion string `json:"minVersion,omitempty"`
}

// RedisBackendStatus is what the manager observed of a backend.
type RedisBackendStatus struct {
	// observedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready says whether the manager reaches this Redis with the admin's
	// credentials and holds the scripts on it.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// namespaces is how many namespaces this backend serves.
	// +optional
	Namespaces int32 `json:"namespaces,omitempty"`

	// conflicts names (at most 10) namespaces this backend selects that an older backend
	// serves.
	// +kubebuilder:validation:MaxItems=10
	// +listType=set
	// +optional
	Conflicts []string `json:"conflicts,omitempty"`
}

// ConditionReady is a RedisBackend's condition: the manager reaches it and its scripts are
// loaded.
const ConditionReady = "Ready"

// RedisBackend gives the namespaces it selects a Redis of their own: their counters,
// heartbeats, Redis users and connection budget live there, and their sidecars are given its
// URL. Namespaces no backend selects use the manager's Redis (--redis-url). Cluster-scoped:
// only cluster administrators map namespaces to backends.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=redline
// +kubebuilder:validation:XValidation:rule="!has(self.spec.tls) || self.spec.url.startsWith('rediss')",message="spec.tls needs a rediss:// or rediss+sentinel:// url"
// +kubebuilder:validation:XValidation:rule="(has(self.spec.namespaceSelector.matchLabels) && size(self.spec.namespaceSelector.matchLabels) > 0) || (has(self.spec.namespaceSelector.matchExpressions) && size(self.spec.namespaceSelector.matchExpressions) > 0)",message="spec.namespaceSelector must select something: name namespaces with matchLabels or matchExpressions (kubernetes.io/metadata.name names one namespace)"
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.url`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Namespaces",type=integer,JSONPath=`.status.namespaces`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RedisBackend struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec names the Redis and the namespaces it serves.
	// +required
	Spec RedisBackendSpec `json:"spec"`

	// status is what the manager observed.
	// +optional
	Status RedisBackendStatus `json:"status,omitempty"`
}

// RedisBackendList is a list of RedisBackend.
// +kubebuilder:object:root=true
type RedisBackendList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RedisBackend `json:"items"`
}
