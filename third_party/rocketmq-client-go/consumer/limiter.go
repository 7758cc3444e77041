package consumer

type Limiter func(topic string)
