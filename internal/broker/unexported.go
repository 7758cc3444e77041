package broker

import (
	"reflect"
	"unsafe"
)

// field returns the field name of the struct v points to, readable though
// it is unexported (reflect alone would refuse to hand it out), or the zero
// Value when v is not a non-nil pointer to a struct with that field. The
// seam uses it only to reach the client instances and producers that the
// pinned client sets once at construction and offers no API for
// (clientOf, halfSender, pushClient); their callers recover from a layout
// that differs.
func field(v reflect.Value, name string) reflect.Value {
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return reflect.Value{}
	}
	f := v.Elem().FieldByName(name)
	if !f.IsValid() {
		return f
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
}
