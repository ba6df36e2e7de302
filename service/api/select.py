"""Routes: select."""

from fastapi import APIRouter

router = APIRouter()
