package errclass

// Error is a failure with its class and a short machine-readable code: the
// one classified error type of rmqtx (consumer.Error and outbox.SendError
// are aliases). The class is metadata: Error's text is the wrapped error's,
// so classifying an error does not change what is logged or stored as its
// text; the class and the code are stored beside it (a dead letter's
// error_class, an outbox row's last_error_code).
type Error struct {
	// Class is how the failure is handled.
	Class Class
	// Code is a short stable reason ("no_permission", "http_503",
	// "sink_panic"), stored where the component has room for it (an
	// outbox row's last_error_code). Empty means the class name
	// (CodeOf).
	Code string
	// Err is the underlying error.
	Err error
}

// New classifies err with class and code (empty: the class name). A nil
// err returns nil, so New(c, "", f()) passes a success through; use
// Wrap for an error that must exist.
func New(class Class, code string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Class: class, Code: code, Err: err}
}

// Wrap is New for an err that may be nil: a nil err becomes an error
// whose text is the class name, so the result is never nil.
func Wrap(class Class, code string, err error) *Error {
	if err == nil {
		err = classText(class)
	}
	return &Error{Class: class, Code: code, Err: err}
}

type classText Class

func (c classText) Error() string { return string(c) }

// Error returns the wrapped error's text (the class and code are not
// repeated in it). An Error without one reads "<class> error (<code>)".
func (e *Error) Error() string {
	if e.Err != nil {
		return e.Err.Error()
	}
	s := string(e.Class) + " error"
	if e.Code != "" {
		s += " (" + e.Code + ")"
	}
	return s
}

// Unwrap returns the underlying error, so errors.Is and errors.As see
// through the classification.
func (e *Error) Unwrap() error { return e.Err }

// ErrorClass returns the class (Classified).
func (e *Error) ErrorClass() Class { return e.Class }

// ErrorCode returns the code, or the class name when Code is empty.
func (e *Error) ErrorCode() string {
	if e.Code != "" {
		return e.Code
	}
	return string(e.Class)
}

// Classified is an error that carries its class. Error implements it, and
// so may a caller's own error types: ClassOf reads them all.
type Classified interface {
	error
	ErrorClass() Class
}

// Find returns the classified error that decides err's class: the
// outermost Classified error in its chain (depth first, in the order
// errors.As walks, through Unwrap() error and Unwrap() []error) whose class
// is one of All. A Classified error with another class name is skipped, as
// if it were not classified, so a classified error it wraps still counts.
// It returns false when there is none.
func Find(err error) (Classified, bool) {
	for err != nil {
		if c, ok := err.(Classified); ok && c.ErrorClass().Valid() {
			return c, true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if c, ok := Find(e); ok {
					return c, true
				}
			}
			return nil, false
		default:
			return nil, false
		}
	}
	return nil, false
}

// Of returns the class of Find(err), and false when err carries none.
func Of(err error) (Class, bool) {
	if c, ok := Find(err); ok {
		return c.ErrorClass(), true
	}
	return "", false
}

// ClassOf returns the class of err: that of Find(err), else Unknown (nobody
// classified it). It returns "" for nil. A component that handles an
// unclassified error otherwise (the outbox: Transient) tests Of itself
// and says so.
func ClassOf(err error) Class {
	if err == nil {
		return ""
	}
	if c, ok := Find(err); ok {
		return c.ErrorClass()
	}
	return Unknown
}

// CodeOf returns the code of err: that of the error that decides its class
// when it has one (an *Error with a Code), else its class name (so
// "unknown" for an unclassified error). It returns "" for nil.
func CodeOf(err error) string {
	if err == nil {
		return ""
	}
	c, ok := Find(err)
	if !ok {
		return string(Unknown)
	}
	if e, ok := c.(*Error); ok {
		return e.ErrorCode()
	}
	return string(c.ErrorClass())
}
