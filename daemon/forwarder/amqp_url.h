// A broker URL from post_broker: amqp://user:password@host:port/vhost or
// amqps://..., parsed by rabbitmq-c's amqp_parse_url (percent-decoding user,
// password and vhost). Defaults: port 5672 (amqps: 5671), user and password
// "guest", vhost "/". A URL that ends in "/" with nothing after it
// ("amqp://host/", as Sarracenia's configurations write it) means vhost "/",
// as Sarracenia reads it, not the empty vhost of the AMQP URI spec.
#pragma once

#include <string>
#include <string_view>

#include "status.h"

namespace postspool::daemon {

struct BrokerUrl {
  std::string url;      // as configured (holds the password: never log it)
  std::string display;  // the URL without the password, for logs
  bool tls = false;
  std::string host;
  int port = 0;
  std::string user;
  std::string password;
  std::string vhost;
};

// kInvalidArgument (naming the URL without its password) if it does not parse.
Status ParseBrokerUrl(std::string_view url, BrokerUrl* out);

// The URL with the password removed ("amqp://user@host/"), for logs.
std::string RedactUrl(std::string_view url);

}  // namespace postspool::daemon
