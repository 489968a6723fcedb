// Package sdk is the one package a driver plugin author imports: the driver
// contract (a two-method core plus optional one-verb capabilities), typed
// errors that survive the plugin boundary, Serve for the plugin's main, and
// Start for hosts that run plugins as processes.
//
// A driver implements Driver. Open returns a BMC for one node; the BMC
// advertises what it can do by the optional interfaces it implements
// (PowerGetter, PowerSetter, BootDeviceSetter, BootDeviceGetter,
// ConsoleOpener, Identifier, EventSubscriber). Capabilities are computed from the value Open returns,
// never declared by hand. A PowerSetter that also implements PowerReporter
// reports how it carried out an action and what it observed (kept in the
// receipt); a Driver that implements OptionValidator checks a node's
// options without I/O, for hosts to call at registration.
//
// Concurrency: the host serializes calls on one BMC (at most one command in
// flight per BMC), except that a console stream runs beside other calls.
// Different BMCs are used in parallel, so a Driver must be safe for
// concurrent use across BMCs.
package sdk

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// ProtocolVersion is the version of the host/plugin protocol, checked in
// the handshake: a host refuses a plugin that speaks another version, and
// says so. The SDK is versioned with obmesh (it lives in obmesh's module);
// ProtocolVersion changes only when a change to the wire is incompatible,
// so a plugin built with any SDK of the same ProtocolVersion works with any
// agent of that version. Calls added within a version degrade: a host
// asking an older plugin for something it lacks gets ErrUnsupported.
const ProtocolVersion = 1

// Driver is the core every plugin implements.
type Driver interface {
	// Info describes the driver. It must not do I/O.
	Info() Info
	// Open connects to the BMC of one node and returns a handle that stays
	// usable until Close. Open should fail fast with a classified error
	// (ErrInvalid for bad or unknown options, ErrAuth, ErrUnreachable) and
	// must honour ctx's deadline.
	Open(ctx context.Context, n Node) (BMC, error)
}

// Info describes a driver.
type Info struct {
	// Name is the driver name nodes refer to, e.g. "ipmi".
	Name string
	// Version is the driver's own version.
	Version string
}

// BMC is one opened BMC. Close releases it (logs out, frees sessions); it is
// idempotent.
type BMC interface {
	Close() error
}

// Node is what a driver is told about one BMC.
type Node struct {
	// Name is the node's name in obmesh.
	Name string
	// Key identifies one registration of the node: it changes when the node
	// is deleted and registered again. Drivers that keep per-node state key
	// it on Key.
	Key string
	// Address is the BMC endpoint: host, host:port or URL, as the driver
	// defines.
	Address string
	// Username for the BMC.
	Username string
	// Password for the BMC. It redacts itself when printed or logged.
	Password Secret
	// Options are driver-specific settings, validated by the driver.
	Options map[string]string
}

// Secret is a string that never prints itself: fmt, slog and encoding/json
// all see "[redacted]". Reveal returns the value.
type Secret string

// Reveal returns the secret's value.
func (s Secret) Reveal() string { return string(s) }

// String implements fmt.Stringer.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

// GoString implements fmt.GoStringer so %#v redacts too.
func (s Secret) GoString() string { return fmt.Sprintf("%q", s.String()) }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText implements encoding.TextMarshaler so JSON and TOML redact.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// PowerAction is a power operation.
type PowerAction string

// Power actions. Cycle and Reset are hard; SoftOff is an ACPI request the OS
// may ignore.
const (
	PowerOn      PowerAction = "on"
	PowerOff     PowerAction = "off"      // hard off
	PowerSoftOff PowerAction = "soft_off" // ACPI shutdown
	PowerCycle   PowerAction = "cycle"    // hard off, then on
	PowerReset   PowerAction = "reset"    // hard reset
)

// Valid reports whether a is one of the defined actions.
func (a PowerAction) Valid() bool {
	switch a {
	case PowerOn, PowerOff, PowerSoftOff, PowerCycle, PowerReset:
		return true
	}
	return false
}

// PowerState is a machine's power state.
type PowerState string

// Power states.
const (
	StateOn          PowerState = "on"
	StateOff         PowerState = "off"
	StatePoweringOn  PowerState = "powering_on"
	StatePoweringOff PowerState = "powering_off"
	StateUnknown     PowerState = "unknown"
)

// PowerStatus is the answer to a power-state read.
type PowerStatus struct {
	// State is the normalized state.
	State PowerState
	// Raw is the driver's own wording when it differs from State (obmd's
	// mock answers "Mock Status"); empty otherwise.
	Raw string
}

// BootDevice names a boot device. The native API sends only the standard
// devices below; the obmd-compatible API passes the name HIL sent as it is
// (obmd's drivers each had their own), so a driver may accept other names
// there. A driver answers ErrInvalid for a name it does not know, and
// ErrUnsupported for a standard device its BMC cannot boot from.
type BootDevice string

// Standard boot devices.
const (
	BootPXE   BootDevice = "pxe"
	BootDisk  BootDevice = "disk"
	BootCDROM BootDevice = "cdrom"
	BootBIOS  BootDevice = "bios"
	BootNone  BootDevice = "none"
)

// StandardBootDevice reports whether d is one of the standard devices.
func StandardBootDevice(d BootDevice) bool {
	switch d {
	case BootPXE, BootDisk, BootCDROM, BootBIOS, BootNone:
		return true
	}
	return false
}

// BootOptions qualify a boot device override.
type BootOptions struct {
	// Persistent keeps the override for every boot; otherwise it applies
	// to the next boot only.
	Persistent bool
	// EFI asks for a UEFI boot rather than legacy BIOS.
	EFI bool
}

// PowerGetter reads power state. It must not change anything.
type PowerGetter interface {
	PowerState(ctx context.Context) (PowerStatus, error)
}

// PowerSetter carries out power actions. An action whose result already holds
// (On while on) succeeds; Cycle and Reset of a machine that is off power it
// on; SoftOff asks the OS and reaches off if it obeys. An unknown action is
// ErrInvalid.
type PowerSetter interface {
	SetPower(ctx context.Context, a PowerAction) error
}

// PowerObservation is a power state a driver read, and when.
type PowerObservation struct {
	State PowerState
	At    time.Time
}

// PowerReport is a driver's account of a power action, kept in the
// operation's receipt: how it was carried out and what was seen.
type PowerReport struct {
	// Detail says how the action was carried out: the BMC command chosen
	// for it and why, e.g. "reset → PowerCycle (ForceRestart is not among
	// the system's allowed reset types)".
	Detail string
	// Observed are the power states read while carrying it out, in order
	// (a state is listed when it changes).
	Observed []PowerObservation
}

// PowerReporter is a PowerSetter that reports what it did and saw. Hosts
// call SetPowerReport instead of SetPower when a BMC has it. The report
// comes back with an error too: ErrOutcomeUnknown says the BMC accepted the
// action but its effect was not seen before the deadline.
type PowerReporter interface {
	SetPowerReport(ctx context.Context, a PowerAction) (PowerReport, error)
}

// OptionValidator is implemented by a Driver that can check a node's
// address, credentials and options without contacting the BMC. Hosts call
// it when a node is registered, so a mistake (a misspelt option, a URL the
// driver will refuse) is refused at the door instead of failing the first
// operation. It must not do I/O; errors are ErrInvalid naming the option.
type OptionValidator interface {
	ValidateOptions(n Node) error
}

// BootDeviceSetter sets the boot device override.
type BootDeviceSetter interface {
	SetBootDevice(ctx context.Context, d BootDevice, o BootOptions) error
}

// ConsoleOpener opens the serial console. ctx bounds the opening only: the
// console lives until Close. At most one console per BMC is open at a time:
// opening a new one may end the previous one. Reads return console output
// (a Read may block while the console is quiet, and must return once Close
// is called); writes are typed into the console; Close ends the console
// session cleanly and is idempotent.
type ConsoleOpener interface {
	OpenConsole(ctx context.Context) (io.ReadWriteCloser, error)
}

// Identity describes a BMC.
type Identity struct {
	Vendor   string
	Model    string
	Firmware string
	Extra    map[string]string
}

// Identifier reports the BMC's identity.
type Identifier interface {
	Identity(ctx context.Context) (Identity, error)
}

// EventCapabilities describe a BMC's event service (Redfish EventService
// or its equivalent).
type EventCapabilities struct {
	// ServiceEnabled is false when the BMC has an event service that is
	// switched off: subscriptions are accepted but nothing is sent.
	ServiceEnabled bool
	// Version is the event service's schema version, e.g. "1.5.0"; "" when
	// unknown.
	Version string
	// EventTypes the BMC accepts in a subscription
	// (EventTypesForSubscription); empty when it does not list them.
	EventTypes []string
	// RegistryPrefixes and ResourceTypes the BMC can filter on; empty means
	// it cannot.
	RegistryPrefixes []string
	ResourceTypes    []string
	// EventTypesRequired reports that a subscription must name event types
	// (old services filter by type only).
	EventTypesRequired bool
	// DeliveryRetryPolicy reports that the BMC accepts DeliveryRetryPolicy.
	DeliveryRetryPolicy bool
	// TestEvent reports that the BMC can send a test event.
	TestEvent bool
	// Resume reports that the BMC advertises the ResumeSubscription action
	// (for subscriptions it suspended after failed deliveries).
	Resume bool
	// MaxSubscriptions is the BMC's limit, 0 when unknown.
	MaxSubscriptions int
}

// Subscription is one event subscription on a BMC, as the BMC lists it.
type Subscription struct {
	// URI is the member's @odata.id exactly as the BMC lists it: the handle
	// for every other call. It is never built from ID.
	URI string
	// ID is the BMC's Id (informational; some BMCs use numbers).
	ID string
	// Destination, Context and Protocol as the BMC reports them (some BMCs
	// do not return Context).
	Destination string
	Context     string
	Protocol    string
	// State is the subscription's Status.State ("Enabled", "Disabled" for a
	// suspended one), "" when not reported.
	State string
	// SubscriptionType is "RedfishEvent", "SSE", ...; "" when not reported.
	SubscriptionType string
	EventTypes       []string
}

// SubscriptionSpec asks for a new subscription.
type SubscriptionSpec struct {
	// Destination is the URL the BMC posts events to.
	Destination string
	// Context is sent with every event; it is how the caller recognises its
	// subscriptions among others on the BMC.
	Context string
	// EventTypes, RegistryPrefixes and ResourceTypes filter events. A
	// driver sends each only where the BMC supports (or requires) it.
	EventTypes       []string
	RegistryPrefixes []string
	ResourceTypes    []string
	// Headers are sent by the BMC with each event; values are secrets and
	// never appear in errors or logs.
	Headers map[string]Secret
	// DeliveryRetryPolicy is the BMC's policy after failed deliveries; ""
	// is the driver's choice (RetryForever where supported).
	DeliveryRetryPolicy string
	// Quirks are vendor quirks learned earlier (persisted by the caller);
	// the driver adapts the payload to them.
	Quirks []string
	// VerifyCA, when set, holds CA certificates (PEM) the BMC should
	// verify the destination's certificate against (Redfish
	// VerifyCertificate with the subscription's Certificates). A BMC that
	// cannot gets the subscription anyway, and the driver reports
	// QuirkNoVerifyCertificate.
	VerifyCA []byte
}

// Vendor quirks a driver learns while subscribing. They are stable strings:
// callers persist them and give them back in SubscriptionSpec.Quirks.
const (
	// QuirkNoEventTypes: the BMC refuses EventTypes (PropertyUnknown).
	QuirkNoEventTypes = "no_event_types"
	// QuirkRequiresEventTypes: the BMC refuses a subscription without
	// EventTypes.
	QuirkRequiresEventTypes = "requires_event_types"
	// QuirkNoDeliveryRetryPolicy: the BMC refuses DeliveryRetryPolicy.
	QuirkNoDeliveryRetryPolicy = "no_delivery_retry_policy"
	// QuirkContextNotReturned: the BMC does not return Context when read;
	// match subscriptions by Destination instead.
	QuirkContextNotReturned = "context_not_returned"
	// QuirkUniqueDestination: the BMC allows one subscription per
	// Destination.
	QuirkUniqueDestination = "unique_destination"
	// QuirkNoHTTPHeaders: the BMC refuses HttpHeaders.
	QuirkNoHTTPHeaders = "no_http_headers"
	// QuirkNoLocation: the BMC answers a create without a Location.
	QuirkNoLocation = "no_location"
	// QuirkHTTPSOnly: the BMC refuses http:// destinations.
	QuirkHTTPSOnly = "https_only"
	// QuirkNoVerifyCertificate: the BMC cannot verify the destination's
	// certificate (no VerifyCertificate or Certificates on the
	// subscription, or it refused the CA): it delivers unverified.
	QuirkNoVerifyCertificate = "no_verify_certificate"
)

// CreateResult is the outcome of Subscribe. It is returned even when
// Subscribe fails, because quirks learned on the way (unique_destination,
// https_only) are worth keeping.
type CreateResult struct {
	// Subscription is the created subscription. Its URI is empty only when
	// Ambiguous. Its Context is the one sent (a BMC with the
	// context_not_returned quirk shows another when listed).
	Subscription Subscription
	// Ambiguous says the create may have happened (a timeout, a reset
	// connection, a 2xx without Location after which listing did not find
	// it): the caller must list before creating again. Subscribe then also
	// returns an error saying why.
	Ambiguous bool
	// Quirks is every quirk in effect after the call: the given ones plus
	// those learned.
	Quirks []string
}

// ListResult is the BMC's subscriptions.
type ListResult struct {
	Subscriptions []Subscription
	// Undecodable are member links that could not be read or decoded. One
	// of them may be the caller's subscription: a caller must not create
	// blindly while this is not empty.
	Undecodable []string
}

// TestEvent describes a test event. Empty fields are the driver's choice.
type TestEvent struct {
	EventType string
	MessageID string
	Message   string
	Severity  string
}

// EventSubscriber manages event subscriptions on a BMC. URIs are the ones
// the BMC gives (Subscription.URI).
type EventSubscriber interface {
	// EventCapabilities describes the event service; ErrUnsupported when
	// the BMC has none.
	EventCapabilities(ctx context.Context) (EventCapabilities, error)
	// ListSubscriptions lists every subscription on the BMC, including
	// those other tools made. Members it cannot read go to Undecodable.
	ListSubscriptions(ctx context.Context) (ListResult, error)
	// Subscribe creates a subscription. Errors: ErrInvalid (a destination
	// the BMC refuses; the message names Destination), ErrConflict (the
	// BMC already has one for this destination), ErrQuota (no free slot),
	// ErrAuth, and retryable classes.
	Subscribe(ctx context.Context, s SubscriptionSpec) (CreateResult, error)
	// Unsubscribe deletes a subscription; one that does not exist is nil.
	Unsubscribe(ctx context.Context, uri string) error
	// SetSubscriptionContext changes a subscription's Context.
	SetSubscriptionContext(ctx context.Context, uri, context string) error
	// ResumeSubscription re-enables a subscription the BMC suspended;
	// ErrUnsupported when the BMC does not offer it.
	ResumeSubscription(ctx context.Context, uri string) error
	// SendTestEvent asks the BMC to send a test event to its subscribers.
	SendTestEvent(ctx context.Context, e TestEvent) error
}

// HasQuirk reports whether q is in quirks.
func HasQuirk(quirks []string, q string) bool {
	for _, x := range quirks {
		if x == q {
			return true
		}
	}
	return false
}

// Capability names a capability on the wire and in listings.
type Capability string

// Capabilities.
const (
	CapPowerGet   Capability = "power_get"
	CapPowerSet   Capability = "power_set"
	CapBootDevice Capability = "boot_device"
	CapConsole    Capability = "console"
	CapIdentity   Capability = "identity"
	CapEvents     Capability = "events"
)

// CapabilitiesOf computes the capabilities a BMC value implements.
func CapabilitiesOf(b BMC) []Capability {
	var caps []Capability
	if c, ok := b.(interface{ Capabilities() []Capability }); ok {
		return c.Capabilities()
	}
	if _, ok := b.(PowerGetter); ok {
		caps = append(caps, CapPowerGet)
	}
	if _, ok := b.(PowerSetter); ok {
		caps = append(caps, CapPowerSet)
	}
	if _, ok := b.(BootDeviceSetter); ok {
		caps = append(caps, CapBootDevice)
	}
	if _, ok := b.(BootDeviceGetter); ok {
		caps = append(caps, CapBootGet)
	}
	if _, ok := b.(ConsoleOpener); ok {
		caps = append(caps, CapConsole)
	}
	if _, ok := b.(Identifier); ok {
		caps = append(caps, CapIdentity)
	}
	if _, ok := b.(EventSubscriber); ok {
		caps = append(caps, CapEvents)
	}
	return caps
}
