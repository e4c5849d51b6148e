#include "amqp_url.h"

#include <string_view>

#include <amqp.h>

#include <vector>

namespace postspool::daemon {

std::string RedactUrl(std::string_view url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return std::string(url);
  const size_t authority = scheme_end + 3;
  const size_t at = url.find('@', authority);
  const size_t slash = url.find('/', authority);
  if (at == std::string_view::npos || (slash != std::string_view::npos && slash < at)) {
    return std::string(url);  // no user information
  }
  const size_t colon = url.find(':', authority);
  if (colon == std::string_view::npos || colon > at) return std::string(url);
  std::string out(url.substr(0, colon));
  out += url.substr(at);
  return out;
}

Status ParseBrokerUrl(std::string_view url, BrokerUrl* out) {
  // amqp_parse_url cuts its argument into pieces in place.
  std::vector<char> copy(url.begin(), url.end());
  copy.push_back('\0');
  amqp_connection_info info;
  amqp_default_connection_info(&info);
  const int rc = amqp_parse_url(copy.data(), &info);
  const std::string display = RedactUrl(url);
  if (rc != AMQP_STATUS_OK || url.find('\0') != std::string_view::npos) {
    return Status(StatusCode::kInvalidArgument,
                  "broker URL " + display + " is not an amqp:// or amqps:// URL");
  }
  BrokerUrl b;
  b.url = std::string(url);
  b.display = display;
  b.tls = info.ssl != 0;
  b.host = info.host;
  b.port = info.port;
  b.user = info.user;
  b.password = info.password;
  // A URL ending in '/' means vhost "/", as Sarracenia reads it.
  const std::string_view vhost = info.vhost != nullptr ? info.vhost : "";
  b.vhost = vhost.empty() ? std::string_view("/") : vhost;
  if (b.host.empty()) {
    return Status(StatusCode::kInvalidArgument, "broker URL " + display + " names no host");
  }
  *out = std::move(b);
  return Status::Ok();
}

}  // namespace postspool::daemon
